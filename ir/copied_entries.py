"""The entries save-forward-values adds as copies of others, and how a copy names its kernels, in a
module without xDSL: the pass names them by it, and the autotuner (runtime, whose warm start must
not import xDSL) finds the copies' launch tables under those names."""

SAVING_ENTRY, SAVED_BACKWARD_ENTRY = "chunk_saving", "chunk_backward_saved"


def copied_kernel_name(kernel: str, copy: str) -> str:
    """The name the entry `copy` gives its copy of `kernel`: the kernel's, with the copy's last
    word appended (`kda_chunk_prepare` in `chunk_saving`: `kda_chunk_prepare_saving`), so that
    the module's symbols stay unique."""
    return f"{kernel}_{copy.rsplit('_', 1)[-1]}"
