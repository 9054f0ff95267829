"""Pictures of a run: step-accuracy plots and the HTML tree viewer."""
