"""The one-command check of a GPU machine: ``python -m gpu_check`` (``gpu_check.check``: the parts and their goals),
``python -m gpu_check.system`` (the whole loop through Ray on one GPU) and ``gpu_check/pack_deps.sh`` (packs what a
GPU machine without Ray or network lacks). Standard library only on import: the check must start where the
project's dependencies are missing, to say which.
"""
