"""`python -m autoresearch_dagster` runs the CLI."""
import sys

from autoresearch_dagster.cli import main

sys.exit(main())
