"""The Hydra configuration of ``lmcbench`` (the yaml files here), shipped as the package data of lmcbench.conf."""
