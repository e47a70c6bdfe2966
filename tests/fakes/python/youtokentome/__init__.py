"""STAND-IN for the `youtokentome` package, NOT its code: an empty module. NeMo 1.22.0 imports it at the top of
its tokenizer modules, which `nemo.utils.exp_manager` pulls in, but exp_manager never calls it; the real package
does not build on Python 3.11. Used only by tests/support/real_nemo_train.py (tests/config/test_nemo_timer_real.py)."""
