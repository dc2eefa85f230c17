"""Pure values and rules of the bridge: no I/O, no imports of the rest of the project."""
