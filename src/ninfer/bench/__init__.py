"""ninfer.bench: `ninfer bench` measurements (synthetic real-shape models, kernels, ceilings).

Imports artifact/, model/, engine/ and kernels/; never the server, protocol or chat layers. Lives
in the package (not tests/) because the CLI runs it; every number it prints says how it was taken.
"""
