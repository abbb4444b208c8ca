"""The bottom layer: what the package asks of the operating system for every command, below the run
folders — child processes that end with their command (:mod:`.processes`, :mod:`.lifeline`) and
one command per folder (:mod:`.lock`). It imports nothing else of the package."""
