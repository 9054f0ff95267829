"""CoaT-tree sampling (docs/method.md §3): fixed-shape, prefix-sharing, one compilation per shape configuration.
``prompts.step_prompts`` / ``pack_tree_prompts`` on the host, then ``tree_sampler.sample_tree`` -> a ``CoaTTree``;
``sections.TreeSampling`` declares the settings the job's ``sampler`` section and ``config.SamplerConfig`` share.
"""
