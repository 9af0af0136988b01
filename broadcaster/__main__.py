from broadcaster.cli import main

main(prog_name="python -m broadcaster")
