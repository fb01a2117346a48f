"""`python -m tether_operator`: the same as the `tether-operator` command."""

from .main import main

main()
