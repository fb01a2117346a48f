from .programs.cli import main

main()
