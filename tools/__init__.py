"""Development tools of the repository, never installed with the server (setuptools packages
only oceanus*): import-linter's custom contracts, found by `lint-imports` run from the root."""
