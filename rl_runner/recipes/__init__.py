"""Training recipes: ``config.py`` (the YAML schema), ``grpo.py`` (the loop, top to bottom) and
one YAML file per recipe (``shellcmd.yaml``, …) with its run command in the header."""
