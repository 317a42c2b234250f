from reconciler.cli.main import main

main()
