"""Write a random tiny Qwen2-VL checkpoint + tokenizer (same as `ipl-jax make-tiny`)."""

import sys

from ipl_jax.cli.make_tiny import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
