"""The configuration file: the loader (YAML to the typed settings) and the reload watcher."""
