"""Scheduling: from a model version's queue to its instances, on the event loop.

`factory.make_scheduler` picks a version's scheduler from its config: the dynamic batcher
(`dynamic_batch.Scheduler`, also the plain queue of a model without batching), or the sequence
batcher (`sequence`, direct strategy; `sequence_oldest`, the oldest strategy; both carry
`implicit_state`). A formed batch goes to an `instance.InstanceThread` (one thread per model
instance, or the event loop itself for cheap batches), through the server-wide `rate_limiter`
when `--rate-limit` is on. Nothing here blocks the loop or knows a wire protocol.
"""
