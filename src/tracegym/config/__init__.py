"""Config loading shared by commands: TOML files with renamed keys migrated (and warned about)."""
