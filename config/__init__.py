"""Settings: the schema (`config.settings`) and the loader (`config.loader`)."""
