"""What both planes share below their cores: the configuration-error family, the field
checks that produce it, the one way a YAML file is read, the one policy model
(`ratemesh.policy`, read from files by `ratemesh.policyfile`), the coordinator API's wire
shapes (`ratemesh.coordinator`) and how an API key is read (`ratemesh.apikey`). Imports
nothing of mesh, governor or sim, so each of them may import it."""
