"""PySpark jobs for bulk state work, starting with state snapshots built from changelogs. Does I/O."""
