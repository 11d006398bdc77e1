"""``python -m replay`` runs the command line."""

from replay._cli import main

main()
