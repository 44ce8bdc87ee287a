"""Campaigns: the research loop of one endpoint from its original baseline to a final confirmed one."""
