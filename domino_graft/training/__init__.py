"""Training a grafted drafter: objective, data, features, resume, final weights, distributed loop.

`domino_graft.training.loop.train` is what `domino-graft train` calls; `regenerate` writes
target-generated responses so the training data matches what the target says.
"""
