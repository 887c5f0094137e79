"""What both planes share below their cores: the configuration-error family, the field
checks that produce it, and the one way a YAML file is read. Imports nothing of mesh,
governor or sim, so each of them may import it."""
