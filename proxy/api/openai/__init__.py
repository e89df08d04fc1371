"""The OpenAI APIs: Chat Completions and Responses, their requests, answers and streams."""
