"""Pretraining objectives, one module each (`bert`, `electra`, `distillation`, `span_boundary`), and their registry
by name (`registry.of(config.objective)`); `objective.Objective` is what each defines."""
