from ..cli.plot import main

if __name__ == "__main__":
    main(prog="python -m fairseq_memattn.plot")
