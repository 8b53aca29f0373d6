from roam_cli.cli import main

main()
