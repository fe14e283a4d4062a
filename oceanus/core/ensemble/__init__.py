"""Ensembles (`platform: "ensemble"`): pipelines of other models, run by the core.

`steps` checks an ensemble's config against its composing models (tensor flow, cycles, dims)
and runs its steps as ordinary `ServerCore.infer` requests, each as soon as its inputs exist
(`EnsembleVersion`); `stream` serves an ensemble whose last step is decoupled, streaming that
step's responses. docs/ensembles.md has the rules.
"""
