"""One module per ``melchior`` subcommand, imported only when that command runs."""
