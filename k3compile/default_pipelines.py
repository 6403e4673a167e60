"""The default pipeline of each spec kind, apart from k3compile.pipeline (which imports xDSL):
k3compile.ops finds a layer's tuned records by its pipeline (the tuning cache's schedule key)
on every process start, and a warm start imports no xDSL."""

# The default pipeline of each spec kind (passes run in order).
# the segment summaries (context parallelism) come with every recurrence: the chunk entry finishes
# the segments, so CP needs no recompilation; so does the chunk entry's backward (training)
RECURRENCE_PIPELINE = ("lower-recurrent,lower-decode,derive-chunkwise,fuse-chunkwise,derive-segment-scan,"
                       "lower-segment-scan,derive-backward,lower-backward,derive-segment-scan-backward,save-forward-values,"
                       "outline-kernels")
DEFAULT_PIPELINES = {
    "kda": RECURRENCE_PIPELINE,
    "gated_deltanet": RECURRENCE_PIPELINE,
    "deltanet": RECURRENCE_PIPELINE,
    "gla": RECURRENCE_PIPELINE,
    "attnres": "fuse-attnres,derive-attnres-backward,derive-block-attnres,derive-block-attnres-backward,outline-kernels",
    "latent_moe": "lower-moe-routing,lower-moe-experts,derive-moe-backward,outline-kernels",
    # no kernels derived: attention runs on torch's (k3compile.vision; docs/vision.md)
    "vision": "",
}
# the pipeline of speculative decoding's serving entries (verify, commit, spec_step; README)
SPECULATIVE_PIPELINE = "derive-replay,lower-speculative"
