"""The experiment renderers, ``experiments/<name>.py`` (installed as ``lmcbench.experiments.<name>``): each
renders a run of ``lmcbench experiment=<name>`` into ``results/<name>/``."""
