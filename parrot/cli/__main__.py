from parrot.cli import main

main()
