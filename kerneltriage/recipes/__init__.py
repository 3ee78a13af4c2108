"""Fix recipes applied in a running process, with no edit to the script.

One applicator for every place that applies a fix: ``profile --apply`` (the runner, before the
script runs), verify's harness (each fixed run) and ``kerneltriage.apply`` (a user's own
script). ``install.py`` holds the kinds a recipe's ``apply`` mapping may name; ``fsdp.py`` the
FSDP2 settings among them. Standard library only: it is imported inside the user's process.
"""
