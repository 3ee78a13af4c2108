from kerneltriage.cli import main

main()
