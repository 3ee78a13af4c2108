"""The fix each verdict prints (data/fixes.yaml): recipes, the environment and preconditions, parameters read from the trace, the choice and its text, what verify measured."""
