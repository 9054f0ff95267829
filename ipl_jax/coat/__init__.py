"""The CoaT action space, fixed-shape trees, leaf rewards and value backup, Step.Acc metrics."""
