"""The pipeline's stages as a library: one module per stage, each a function of plain typed arguments."""
