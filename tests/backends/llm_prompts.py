"""The prompts the LLM tests send: short and long (the long ones prefill over several chunks
when the engine's prefill budget is small), one of them code."""

PROMPTS = [
    "The ocean covers",
    "Hello world! How are you today? I am fine, thank you. What is the weather like",
    "def main(): return",
    "Tides rise and fall twice a day, pulled by the moon and the sun. Waves carry energy",
]
