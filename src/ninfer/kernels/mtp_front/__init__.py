"""The MTP head's front: the next token's embedding and the hidden state, each RMS-normed, side
by side (CUDA launcher and torch twin)."""
