"""The command line: `lit-attn` (command.py), the Lightning CLI of fit/validate/test/predict with its parser, help
and checks, run directories and their lock, and the tools' shared parsing. It sits above the training code,
callbacks/ and datamodules/, and below the tools."""
