"""The worlds a policy plays: the synthetic GUI world (``synthetic``) and its dataset writers."""
