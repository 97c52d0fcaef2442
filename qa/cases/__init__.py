"""Case modules: each registers its cases on import (`qa.registry.case` / `add`); every module
here is imported by `qa.registry.all_cases()`, so a new file needs no other edit."""
