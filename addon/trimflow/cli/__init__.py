"""The command-line tools: `python -m trimflow COMMAND` imports each one's module from `__main__.COMMANDS`."""
