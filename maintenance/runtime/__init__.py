"""What everything of the bundle stands on: database access, logs and their masking of credentials, signals, migrations."""
