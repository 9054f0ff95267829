"""Training state, optimizer, the SFT step, LoRA adapters, Orbax checkpoints."""
