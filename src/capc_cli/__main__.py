from capc_cli.main import main

main()
