"""`python -m minilmd.cli ...`: how the supervisor launches trainers (`python -m minilmd.cli train ...`)."""
from minilmd.cli import main

if __name__ == "__main__":  # importing this module (the layer tests import every module) runs nothing
    main()
