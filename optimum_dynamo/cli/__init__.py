"""optimum-cli's export commands under `--dynamo`.

`arguments`: this package's options, added to the parser optimum builds (an option optimum already defines
is taken over or left to optimum, never defined twice); `driver`: the one run of an export command (flags ->
output check -> notices -> export -> interrupts -> fallback), configured by each command; `wrap`: gives an
optimum command class those options and that run; `onnx` and `executorch`: the two commands; `register`:
the export commands optimum-dynamo's register file puts back.
"""
