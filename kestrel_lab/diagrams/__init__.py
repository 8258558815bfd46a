"""Conceptual diagrams drawn from the package's own data, so a picture changes when the code does.

One module per diagram (the VQF file to scale from the planner, the byte-to-unicode map from the
vocabulary code, a Q4_0/Q8_0 block from the quantizers, the KV cache's strides, the GQA grouping).
Each function takes the data it draws (or builds it from the package) and returns a matplotlib
Figure with a Chinese title and Chinese axis labels; the notebooks call them and show the result.
"""
