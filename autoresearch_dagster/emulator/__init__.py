"""The serving-engine emulator: catalog, cost model, SGLang-like engine core, virtual-time driver, profiles."""
