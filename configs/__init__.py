"""The job's ml_collections configs (shipped inside the package) and the one config loader."""
