from evalpipe.cli import main

main()
