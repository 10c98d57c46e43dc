"""One module per command (``gdr <command>`` runs ``gdr.cli.commands.<module>.<command>_main``); no command
module imports another: what they share is :mod:`gdr.cli.common` and the library (:mod:`gdr.stages`)."""
