"""The building blocks a model family composes: Linear, Embedding, RMSNorm, rotary,
attention and MLP, each through :mod:`pagedchat.kernels`."""
