"""Parrot under other frameworks (imports parrot.frontend and parrot.protocol only).

`parrot.integrations.langchain`: LangChain chat and completion models whose calls are Semantic
Variables (needs `langchain-core`: `pip install parrot-serve[langchain]`).
"""
