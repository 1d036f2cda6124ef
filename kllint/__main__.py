from kllint.cli import main

main()
