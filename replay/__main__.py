"""``python -m replay`` runs the command line."""

from replay._main import main

main()
